//! MCP federation through real MCP servers: the example rmcp server and the third-party
//! `mcp-server-time` (PyPI, provisioned into target/test-deps by crate::common::provision). Policy,
//! inline execution, permissions, restarts, timeouts, list_changed, secrets and shutdown.

use crate::common::mcp::example_server;
use crate::common::{config_text, logcheck::check_log, names, setup, TestServer};
use serde_json::{json, Value};
use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};

const POLICY: &str = r#"
[policy]
trust = ["mcp__ex__add", "mcp__ex__slow", "mcp__ex__pid", "mcp__ex__add_tool", "mcp__ex__env", "mcp__ex__fresh", "mcp__ex__image", "mcp__time__*"]
ask = ["mcp__ex__echo"]
deny = ["mcp__ex__write_file"]
default = "ask"
"#;

/// The example server `ex` (with `server_extra` in its table) under [`POLICY`].
async fn with_example_server(server_extra: &str) -> (FakeOpenAi, TestServer) {
    setup(&format!("{}\n{POLICY}", example_server("ex", server_extra))).await
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

fn tool_messages(req: &Value) -> Vec<Value> {
    req["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .cloned()
        .collect()
}

async fn turn(server: &TestServer, sid: &str, body: Value) -> Value {
    let (status, resp) = server
        .http
        .post(&format!("/sessions/{sid}/turns"), &body)
        .await;
    assert_eq!(status, 200, "{resp}");
    resp
}

fn user(text: &str) -> Value {
    json!({"messages": [{"role": "user", "content": text}]})
}

#[tokio::test]
async fn meta_and_tools_list_federated_tools_with_verdicts_and_denied_ones_are_hidden() {
    let (_fake, server) = with_example_server("").await;
    let (_, meta) = server.http.get("/meta").await;
    let exposed: Vec<&str> = meta["agents"][0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert!(
        exposed.contains(&"mcp__ex__add") && exposed.contains(&"mcp__ex__echo"),
        "{exposed:?}"
    );
    assert!(
        !exposed.contains(&"mcp__ex__write_file"),
        "denied tools are not exposed"
    );
    let add = meta["agents"][0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "mcp__ex__add")
        .unwrap();
    assert_eq!(add["parameters"]["type"], "object");
    assert!(add["parameters"]["properties"]["a"].is_object(), "{add}");

    let (status, tools) = server.http.get("/tools").await;
    assert_eq!(status, 200);
    let find = |n: &str| {
        tools["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == n)
            .cloned()
            .unwrap()
    };
    assert_eq!(
        find("mcp__ex__write_file"),
        json!({"name": "mcp__ex__write_file", "server": "ex", "tool": "write_file", "verdict": "deny",
               "rule": "mcp__ex__write_file", "description": find("mcp__ex__write_file")["description"]})
    );
    assert_eq!(find("mcp__ex__echo")["verdict"], "ask");
    assert_eq!(find("mcp__ex__add")["verdict"], "trust");
    assert_eq!(find("mcp__ex__add")["rule"], "mcp__ex__add");
    assert_eq!(find("mcp__ex__cwd")["rule"], "default");
}

#[tokio::test]
async fn a_trusted_tool_runs_inline_and_the_model_sees_its_result() {
    let (fake, server) = with_example_server("").await;
    let sid = server.session(json!({})).await;
    fake.push(Reply::tool_calls(&[(
        "call_1",
        "mcp__ex__add",
        json!({"a": 2, "b": 3}),
    )]));
    fake.push(Reply::text("The sum is 5."));
    let events = server
        .http
        .post_sse(
            &format!("/sessions/{sid}/turns"),
            &json!({"stream": "message", "messages": [{"role": "user", "content": "2+3?"}]}),
        )
        .await;
    assert_eq!(
        names(&events),
        vec![
            "turn_start",
            "tool_call",
            "tool_result",
            "text",
            "turn_stop"
        ]
    );
    assert_eq!(events[2].data["toolCallId"], "call_1");
    let content = events[2].data["content"].to_string();
    assert!(content.contains('5'), "{content}");
    assert_eq!(events[4].data["stopReason"], "end_turn");
    let reqs = fake.requests();
    let tools = offered(&reqs[0]);
    assert!(
        tools.contains(&"mcp__ex__add".to_string())
            && !tools.contains(&"mcp__ex__write_file".to_string()),
        "{tools:?}"
    );
    let results = tool_messages(&reqs[1]);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0]["tool_call_id"], "call_1");
    assert!(results[0]["content"].as_str().unwrap().contains('5'));
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn an_ask_tool_pauses_for_permission_and_runs_its_stored_call_when_granted() {
    let (fake, server) = with_example_server("").await;
    let sid = server
        .session(json!({"agent": {"name": "assistant", "tools": [{"name": "mcp__ex__echo", "trust": true}]}}))
        .await;
    fake.push(Reply::tool_calls(&[(
        "call_e",
        "mcp__ex__echo",
        json!({"text": "from the model"}),
    )]));
    let resp = turn(&server, &sid, user("echo it")).await;
    assert_eq!(
        resp["stopReason"], "tool_use",
        "ask beats the session's trust: {resp}"
    );
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["pending"][0]["kind"], "permission");
    // A tool result for a server call is the wrong answer.
    let (status, err) = server
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "tool", "toolCallId": "call_e", "content": "forged"}]}),
        )
        .await;
    assert_eq!(status, 400, "{err}");
    assert!(err["error"]["message"]
        .as_str()
        .unwrap()
        .contains("tool_permission"));

    fake.push(Reply::text("It said: from the model"));
    let resp = turn(
        &server,
        &sid,
        json!({"messages": [{"role": "tool_permission", "toolCallId": "call_e", "granted": true}]}),
    )
    .await;
    assert_eq!(
        resp,
        json!({"stopReason": "end_turn", "messages": [
            {"role": "tool", "toolCallId": "call_e", "content": "from the model"},
            {"role": "assistant", "content": "It said: from the model"}
        ]})
    );
    assert_eq!(
        tool_messages(&fake.requests()[1]),
        vec![json!({"role": "tool", "tool_call_id": "call_e", "content": "from the model"})]
    );
    let (_, hist) = server
        .http
        .get(&format!("/sessions/{sid}/history?type=full"))
        .await;
    assert!(
        !hist.to_string().contains("tool_permission"),
        "permissions never enter history"
    );
    check_log(server.engine().store(), &sid).await;
}

/// A granted call runs only once its grant is in the log: when that commit fails, the answer is
/// refused (503) with nothing run, and the same answer sent again runs the call once.
#[tokio::test]
async fn a_granted_call_runs_only_once_its_grant_is_in_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let calls = dir.path().join("calls.txt");
    let args = format!(
        "args = [\"--log-calls\", {:?}]",
        calls.display().to_string()
    );
    let (fake, server) = with_example_server(&args).await;
    let sid = server.session(json!({})).await;
    fake.push(Reply::tool_calls(&[(
        "call_e",
        "mcp__ex__echo",
        json!({"text": "once"}),
    )]));
    let resp = turn(&server, &sid, user("echo it")).await;
    assert_eq!(resp["stopReason"], "tool_use", "{resp}");
    let grant =
        json!({"messages": [{"role": "tool_permission", "toolCallId": "call_e", "granted": true}]});

    server.engine().store().fail_commits(1);
    let (status, err) = server
        .http
        .post(&format!("/sessions/{sid}/turns"), &grant)
        .await;
    assert_eq!(status, 503, "{err}");
    assert_eq!(err["error"]["type"], "store_unavailable", "{err}");
    let ran = std::fs::read_to_string(&calls).unwrap_or_default();
    assert_eq!(
        ran.lines().count(),
        0,
        "the call ran before its grant was logged: {ran}"
    );

    fake.push(Reply::text("It said: once"));
    let resp = turn(&server, &sid, grant).await;
    assert_eq!(resp["stopReason"], "end_turn", "{resp}");
    assert_eq!(resp["messages"][0]["content"], "once", "{resp}");
    let ran = std::fs::read_to_string(&calls).unwrap_or_default();
    assert_eq!(ran.lines().count(), 1, "{ran}");
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn a_denial_with_a_reason_is_told_to_the_model_and_nothing_runs() {
    let (fake, server) = with_example_server("").await;
    let sid = server
        .session(json!({"agent": {"name": "assistant", "tools": [{"name": "mcp__ex__add"}]}}))
        .await;
    // add is trusted by the operator but not by this session: it pauses.
    fake.push(Reply::tool_calls(&[(
        "call_d",
        "mcp__ex__add",
        json!({"a": 1, "b": 1}),
    )]));
    let resp = turn(&server, &sid, user("add")).await;
    assert_eq!(resp["stopReason"], "tool_use");
    fake.push(Reply::text("OK, I will not."));
    let resp = turn(
        &server,
        &sid,
        json!({"stream": "none", "messages": [{"role": "tool_permission", "toolCallId": "call_d", "granted": false, "reason": "not today"}]}),
    )
    .await;
    assert_eq!(
        resp["messages"][0],
        json!({"role": "tool", "toolCallId": "call_d", "content": "Tool call denied: not today"})
    );
    assert_eq!(
        tool_messages(&fake.requests()[1])[0]["content"],
        "Tool call denied: not today"
    );
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn client_and_server_calls_are_answered_together_in_one_follow_up() {
    let (fake, server) = with_example_server("").await;
    let sid = server
        .session(json!({
            "agent": {"name": "assistant", "tools": [{"name": "mcp__ex__echo"}, {"name": "mcp__ex__add", "trust": true}]},
            "tools": [{"name": "get_location", "description": "where the user is", "parameters": {"type": "object"}}]
        }))
        .await;
    fake.push(Reply::tool_calls(&[
        ("call_c", "get_location", json!({})),
        ("call_s", "mcp__ex__echo", json!({"text": "x"})),
        ("call_t", "mcp__ex__add", json!({"a": 40, "b": 2})),
    ]));
    let events = server
        .http
        .post_sse(
            &format!("/sessions/{sid}/turns"),
            &json!({"stream": "delta", "messages": [{"role": "user", "content": "go"}]}),
        )
        .await;
    assert_eq!(
        names(&events),
        vec![
            "turn_start",
            "tool_call",
            "tool_call",
            "tool_call",
            "tool_result",
            "turn_stop"
        ]
    );
    assert_eq!(
        events[4].data["toolCallId"], "call_t",
        "the trusted call ran inline"
    );
    assert_eq!(events[5].data["stopReason"], "tool_use");
    fake.push(Reply::text("done"));
    let resp = turn(
        &server,
        &sid,
        json!({"messages": [
            {"role": "tool", "toolCallId": "call_c", "content": "Paris"},
            {"role": "tool_permission", "toolCallId": "call_s", "granted": true}
        ]}),
    )
    .await;
    assert_eq!(resp["stopReason"], "end_turn");
    // The client's own result is not echoed; the granted call's result is.
    let roles: Vec<&str> = resp["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, vec!["tool", "assistant"]);
    assert_eq!(resp["messages"][0]["toolCallId"], "call_s");
    let results = tool_messages(&fake.requests()[1]);
    let ids: Vec<&str> = results
        .iter()
        .map(|m| m["tool_call_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["call_t", "call_c", "call_s"]);
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn denied_and_unknown_tools_get_error_results_and_the_turn_goes_on() {
    let (fake, server) = with_example_server("").await;
    let sid = server.session(json!({})).await;
    let target = server.dir.path().join("pwned.txt");
    fake.push(Reply::tool_calls(&[
        (
            "call_w",
            "mcp__ex__write_file",
            json!({"path": target.display().to_string(), "text": "pwned"}),
        ),
        ("call_u", "no_such_tool", json!({})),
    ]));
    fake.push(Reply::text("Sorry."));
    let resp = turn(&server, &sid, user("try")).await;
    assert_eq!(resp["stopReason"], "end_turn");
    let results = tool_messages(&fake.requests()[1]);
    assert!(
        results[0]["content"]
            .as_str()
            .unwrap()
            .contains("denied by policy"),
        "{results:?}"
    );
    assert!(
        results[1]["content"]
            .as_str()
            .unwrap()
            .contains("Unknown tool no_such_tool"),
        "{results:?}"
    );
    assert!(!target.exists(), "a denied tool never runs");
    let log = check_log(server.engine().store(), &sid).await;
    assert!(log.iter().any(|e| e.json.contains("\"is_error\":true")));
}

#[tokio::test]
async fn a_call_that_outlives_timeout_s_gets_an_error_result() {
    let (fake, server) = with_example_server("timeout_s = 1").await;
    let sid = server.session(json!({})).await;
    fake.push(Reply::tool_calls(&[(
        "call_s",
        "mcp__ex__slow",
        json!({"ms": 3000}),
    )]));
    fake.push(Reply::text("too slow"));
    turn(&server, &sid, user("wait")).await;
    let result = &tool_messages(&fake.requests()[1])[0];
    // Spec 003: a call past its timeout is answered "Cancelled." (the reason is logged).
    assert_eq!(result["content"], "Cancelled.", "{result}");
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn children_see_their_env_table_but_no_secrets() {
    // Secrets in turnstile's own environment, which its children must not inherit.
    let fake = FakeOpenAi::start().await;
    let extra = format!(
        "{}\n{POLICY}",
        example_server("ex", "env = { GREETING = \"hello\" }")
    );
    let secrets = [
        ("OPENAI_API_KEY", "sk-secret-upstream"),
        ("TURNSTILE_API_KEYS", "secret-key"),
    ];
    let server = TestServer::start_with_env(&config_text(&fake, &extra), &secrets).await;
    let sid = server.session(json!({})).await;
    fake.push(Reply::tool_calls(&[
        ("c1", "mcp__ex__env", json!({"name": "OPENAI_API_KEY"})),
        ("c2", "mcp__ex__env", json!({"name": "TURNSTILE_API_KEYS"})),
        ("c3", "mcp__ex__env", json!({"name": "GREETING"})),
        ("c4", "mcp__ex__env", json!({"name": "PATH"})),
    ]));
    fake.push(Reply::text("ok"));
    turn(&server, &sid, user("env")).await;
    let results = tool_messages(&fake.requests()[1]);
    let by_id = |id: &str| {
        results.iter().find(|m| m["tool_call_id"] == id).unwrap()["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(by_id("c1"), "<unset>");
    assert_eq!(by_id("c2"), "<unset>");
    assert_eq!(by_id("c3"), "hello");
    assert_ne!(by_id("c4"), "<unset>");
}

#[tokio::test]
async fn list_changed_refreshes_the_federated_tools() {
    let (fake, server) = with_example_server("").await;
    let sid = server.session(json!({})).await;
    let mut generation = server.engine().tools_changed();
    generation.borrow_and_update();
    fake.push(Reply::tool_calls(&[(
        "call_n",
        "mcp__ex__add_tool",
        json!({"name": "fresh"}),
    )]));
    fake.push(Reply::text("added"));
    turn(&server, &sid, user("add a tool")).await;
    assert!(!offered(&fake.requests()[0]).contains(&"mcp__ex__fresh".to_string()));
    generation.changed().await.expect("the tool set changes");
    let (_, tools) = server.http.get("/tools").await;
    let fresh = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "mcp__ex__fresh")
        .cloned()
        .expect("listed");
    assert_eq!(fresh["verdict"], "trust", "policy applies to the new tool");
    fake.push(Reply::tool_calls(&[(
        "call_f",
        "mcp__ex__fresh",
        json!({}),
    )]));
    fake.push(Reply::text("fresh works"));
    turn(&server, &sid, user("use it")).await;
    let reqs = fake.requests();
    assert!(offered(&reqs[2]).contains(&"mcp__ex__fresh".to_string()));
    assert_eq!(
        tool_messages(&reqs[3]).last().unwrap()["content"],
        "hello from fresh"
    );
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn no_child_outlives_the_server() {
    let (fake, server) = with_example_server("").await;
    let sid = server.session(json!({})).await;
    fake.push(Reply::tool_calls(&[("call_p", "mcp__ex__pid", json!({}))]));
    fake.push(Reply::text("ok"));
    turn(&server, &sid, user("pid")).await;
    let pid: i32 = tool_messages(&fake.requests()[1])[0]["content"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(alive(pid), "the child runs while the server does");
    server.stop().await;
    assert!(!alive(pid), "child {pid} outlived the server");
}

/// Whether a process exists and is not a zombie.
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

#[tokio::test]
async fn a_third_party_server_is_federated_and_called() {
    let python = crate::common::provision::python();
    let fake = FakeOpenAi::start().await;
    let extra = format!(
        "[mcp_servers.time]\ncommand = {:?}\nargs = [\"-m\", \"mcp_server_time\", \"--local-timezone\", \"UTC\"]\n{POLICY}",
        python.display().to_string()
    );
    let server = TestServer::start(&config_text(&fake, &extra)).await;
    let sid = server.session(json!({})).await;
    fake.push(Reply::tool_calls(&[(
        "call_t",
        "mcp__time__get_current_time",
        json!({"timezone": "Europe/Paris"}),
    )]));
    fake.push(Reply::text("It is now."));
    turn(&server, &sid, user("time in Paris?")).await;
    let result = &tool_messages(&fake.requests()[1])[0];
    let text = result["content"].as_str().unwrap();
    assert!(
        text.contains("Europe/Paris") && text.contains("datetime"),
        "{text}"
    );
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn a_child_killed_mid_call_fails_that_call_and_the_next_call_succeeds_after_restart() {
    let (fake, server) = with_example_server("timeout_s = 20").await;
    let sid = server.session(json!({})).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let notify = listener.local_addr().unwrap().to_string();
    fake.push(Reply::tool_calls(&[(
        "call_s",
        "mcp__ex__slow",
        json!({"ms": 60000, "notify": notify}),
    )]));
    fake.push(Reply::text("the tool crashed"));
    let http = server.http.clone();
    let path = format!("/sessions/{sid}/turns");
    let running = tokio::spawn(async move { http.post(&path, &user("slow")).await });
    // The call is in flight once the tool connects back with its pid.
    let (conn, _) = listener.accept().await.unwrap();
    let mut line = String::new();
    tokio::io::AsyncBufReadExt::read_line(&mut tokio::io::BufReader::new(conn), &mut line)
        .await
        .unwrap();
    let pid: i32 = line.trim().parse().unwrap();
    assert_eq!(unsafe { libc_kill(pid, 9) }, 0);
    let (status, resp) = running.await.unwrap();
    assert_eq!(status, 200, "{resp}");
    let failed = &tool_messages(&fake.requests()[1])[0];
    assert_eq!(failed["tool_call_id"], "call_s");
    assert!(
        failed["content"]
            .as_str()
            .unwrap()
            .contains("MCP server ex"),
        "{failed}"
    );
    // The supervisor restarts the child; the next call waits for it and succeeds.
    fake.push(Reply::tool_calls(&[(
        "call_a",
        "mcp__ex__add",
        json!({"a": 1, "b": 2}),
    )]));
    fake.push(Reply::text("3"));
    turn(&server, &sid, user("again")).await;
    let ok = &tool_messages(&fake.requests()[3]).last().unwrap().clone();
    assert!(ok["content"].as_str().unwrap().starts_with('3'), "{ok}");
    let log = check_log(server.engine().store(), &sid).await;
    assert!(log
        .iter()
        .any(|e| e.json.contains("\"tool_use_id\":\"call_s\"")
            && e.json.contains("\"is_error\":true")));
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

#[tokio::test]
async fn a_remote_streamable_http_server_is_federated_with_expanded_headers() {
    let mut child = tokio::process::Command::new(crate::common::mcp::example_server_path())
        .args(["--http", "127.0.0.1:0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = tokio::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line)
        .await
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .expect("url line")
        .to_string();
    let fake = FakeOpenAi::start().await;
    let extra = format!(
        "[mcp_servers.remote]\nurl = {url:?}\nheaders = {{ Authorization = \"Bearer ${{TURNSTILE_TEST_REMOTE_TOKEN}}\" }}\n\n[policy]\ntrust = [\"mcp__remote__*\"]\n"
    );
    let server = TestServer::start_with_env(
        &config_text(&fake, &extra),
        &[("TURNSTILE_TEST_REMOTE_TOKEN", "t0ken")],
    )
    .await;
    let sid = server.session(json!({})).await;
    fake.push(Reply::tool_calls(&[(
        "call_r",
        "mcp__remote__echo",
        json!({"text": "over http"}),
    )]));
    fake.push(Reply::text("ok"));
    turn(&server, &sid, user("remote")).await;
    assert!(offered(&fake.requests()[0]).contains(&"mcp__remote__add".to_string()));
    assert_eq!(
        tool_messages(&fake.requests()[1])[0]["content"],
        "over http"
    );
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn session_scoped_servers_run_in_the_session_workspace_and_stop_with_the_session() {
    let fake = FakeOpenAi::start().await;
    let extra = format!(
        "{}\n[policy]\ntrust = [\"mcp__ws__*\"]\n",
        example_server(
            "ws",
            "scope = \"session\"\nargs = [\"--extra-tool\", \"in_{workspace}\"]"
        )
    );
    let server = TestServer::start(&config_text(&fake, &extra)).await;
    let a = server.session(json!({})).await;
    let b = server.session(json!({})).await;
    for sid in [&a, &b] {
        fake.push(Reply::tool_calls(&[
            ("call_c", "mcp__ws__cwd", json!({})),
            ("call_p", "mcp__ws__pid", json!({})),
        ]));
        fake.push(Reply::text("ok"));
        turn(&server, sid, user("where?")).await;
    }
    let reqs = fake.requests();
    let results = |i: usize| -> (String, i32) {
        let msgs = tool_messages(&reqs[i]);
        let get = |id: &str| {
            msgs.iter().find(|m| m["tool_call_id"] == id).unwrap()["content"]
                .as_str()
                .unwrap()
                .to_string()
        };
        (get("call_c"), get("call_p").parse().unwrap())
    };
    let (cwd_a, pid_a) = results(1);
    let (cwd_b, pid_b) = results(3);
    let sandboxes = std::fs::canonicalize(server.dir.path().join("sandboxes")).unwrap();
    assert_eq!(std::path::PathBuf::from(&cwd_a), sandboxes.join(&a));
    assert_eq!(std::path::PathBuf::from(&cwd_b), sandboxes.join(&b));
    assert_ne!(pid_a, pid_b, "one process per session");
    assert!(alive(pid_a));
    let (status, _) = server.http.delete(&format!("/sessions/{a}")).await;
    assert_eq!(status, 204);
    assert!(!alive(pid_a), "deleting the session stops its server");
    assert!(alive(pid_b), "the other session's server runs on");
}

async fn check(config: &str) -> (bool, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tools.toml");
    std::fs::write(&path, config).unwrap();
    let out = crate::common::binary::command()
        .args(["check", "--config"])
        .arg(&path)
        .env("RUST_LOG", "error")
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn check_prints_each_tool_with_its_verdict_and_rule_and_fails_on_errors() {
    let (ok, stdout, stderr) = check(&format!(
        "{}\n{POLICY}\n[policy.x]\n",
        example_server("ex", "")
    ))
    .await;
    assert!(!ok, "an unknown key is an error");
    assert!(
        stderr.contains("tools.toml") && stderr.contains("policy"),
        "{stderr}"
    );
    assert!(stdout.is_empty());

    let (ok, stdout, stderr) = check(&format!("{}\n{POLICY}", example_server("ex", ""))).await;
    assert!(ok, "{stdout}\n{stderr}");
    let row = |name: &str| {
        stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("{name} missing:\n{stdout}"))
            .to_string()
    };
    assert_eq!(
        row("mcp__ex__write_file")
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["mcp__ex__write_file", "deny", "mcp__ex__write_file", "ex"]
    );
    assert_eq!(
        row("mcp__ex__echo").split_whitespace().collect::<Vec<_>>(),
        ["mcp__ex__echo", "ask", "mcp__ex__echo", "ex"]
    );
    assert_eq!(
        row("mcp__ex__cwd").split_whitespace().collect::<Vec<_>>(),
        ["mcp__ex__cwd", "ask", "default", "ex"]
    );
    assert!(
        stdout.contains("policy.trust pattern \"mcp__time__*\" matches no tool"),
        "{stdout}"
    );

    let (ok, _, stderr) = check(&example_server(
        "ex",
        "args = [\"--extra-tool\", \"get.thing\", \"--extra-tool\", \"get_thing\"]",
    ))
    .await;
    assert!(!ok);
    assert!(
        stderr.contains("get.thing")
            && stderr.contains("get_thing")
            && stderr.contains("mcp__ex__get_thing"),
        "{stderr}"
    );

    let (ok, _, stderr) =
        check("[mcp_servers.broken]\ncommand = \"/nonexistent/server\"\nstartup_timeout_s = 2\n")
            .await;
    assert!(!ok);
    assert!(
        stderr.contains("MCP server broken") && stderr.contains("/nonexistent/server"),
        "{stderr}"
    );
}

/// Two writes through a session-scoped example server: one inside its workspace, one outside.
async fn write_inside_and_outside(
    sandbox: &str,
) -> (
    Vec<Value>,
    std::path::PathBuf,
    std::path::PathBuf,
    tempfile::TempDir,
) {
    let fake = FakeOpenAi::start().await;
    let extra = format!(
        "{}\n[policy]\ntrust = [\"mcp__box__*\"]\n",
        example_server(
            "box",
            &format!("scope = \"session\"\nsandbox = \"{sandbox}\"")
        )
    );
    let server = TestServer::start(&config_text(&fake, &extra)).await;
    let sid = server.session(json!({})).await;
    let outside = server.dir.path().join("outside.txt");
    fake.push(Reply::tool_calls(&[
        (
            "c_in",
            "mcp__box__write_file",
            json!({"path": "inside.txt", "text": "ok"}),
        ),
        (
            "c_out",
            "mcp__box__write_file",
            json!({"path": outside.display().to_string(), "text": "escaped"}),
        ),
    ]));
    fake.push(Reply::text("done"));
    turn(&server, &sid, user("write")).await;
    check_log(server.engine().store(), &sid).await;
    let inside = server
        .dir
        .path()
        .join("sandboxes")
        .join(&sid)
        .join("inside.txt");
    let results = tool_messages(&fake.requests()[1]);
    // The folder lives until the caller has looked at the files.
    let dir = server.stop().await;
    (results, inside, outside, dir)
}

#[tokio::test]
async fn landlock_confines_a_session_server_to_its_workspace() {
    assert!(
        turnstile::tools::mcp::sandbox::available(),
        "this machine's kernel must enforce Landlock (CI runs on the same kind of machine)"
    );
    let (results, inside, outside, _dir) = write_inside_and_outside("landlock").await;
    let by_id = |id: &str| {
        results.iter().find(|m| m["tool_call_id"] == id).unwrap()["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(by_id("c_in"), "wrote 2 bytes");
    assert!(
        by_id("c_out").contains("Permission denied"),
        "{}",
        by_id("c_out")
    );
    assert_eq!(std::fs::read_to_string(&inside).unwrap(), "ok");
    assert!(
        !outside.exists(),
        "the confined server wrote outside its workspace"
    );

    // The same server unconfined can write there: the sandbox is what stopped it.
    let (results, _, outside, _dir) = write_inside_and_outside("none").await;
    assert_eq!(
        results
            .iter()
            .find(|m| m["tool_call_id"] == "c_out")
            .unwrap()["content"],
        "wrote 7 bytes"
    );
    assert_eq!(std::fs::read_to_string(&outside).unwrap(), "escaped");
}

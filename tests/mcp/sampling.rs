//! MCP sampling: a real child server (the official Python SDK, tests/mcp_sampling/
//! sampling_server.py) asks for completions during a tool call; turnstile answers them from the
//! session's upstream (the fake, which records each request) within the server's budget, counts
//! them into the turn's usage and metrics, and refuses them past the budget or where the server
//! is not allowed to sample. A call through `/mcp` is sampled by the MCP client that made it.

use std::time::Duration;

use crate::common::logcheck::check_log;
use crate::common::{config_text, TestServer};
use serde_json::{json, Value};
use turnstile::log::EventBody;
use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};

/// A `[mcp_servers.NAME]` table running the sampling server, with `extra` lines, trusted.
fn sampling_server(name: &str, extra: &str) -> String {
    let script =
        crate::common::provision::manifest_dir().join("tests/mcp_sampling/sampling_server.py");
    format!(
        "[mcp_servers.{name}]\ncommand = {:?}\nargs = [{:?}]\n{extra}\n\n[policy]\ntrust = [\"mcp__{name}__*\"]\n",
        crate::common::provision::python().display().to_string(),
        script.display().to_string()
    )
}

async fn turn(server: &TestServer, sid: &str, text: &str) -> Value {
    let body = json!({"messages": [{"role": "user", "content": text}]});
    let (status, v) = tokio::time::timeout(
        Duration::from_secs(60),
        server.http.post(&format!("/sessions/{sid}/turns"), &body),
    )
    .await
    .expect("the turn did not finish within 60 s");
    assert_eq!(status, 200, "{v}");
    v
}

/// The text of the one `agent.tool_result` of the session's log, and the usage of its last
/// completed turn.
async fn outcome(server: &TestServer, sid: &str) -> (String, (u64, u64)) {
    let events = check_log(server.engine().store(), sid).await;
    let result = events
        .iter()
        .find_map(|e| match &e.body {
            EventBody::ToolResult {
                content, is_error, ..
            } => {
                assert!(!is_error, "the tool call failed: {content}");
                Some(content.as_str().map_or(content.to_string(), str::to_string))
            }
            _ => None,
        })
        .expect("a tool result");
    let usage = events
        .iter()
        .rev()
        .find_map(|e| match &e.body {
            EventBody::TurnCompleted { usage, .. } => *usage,
            _ => None,
        })
        .expect("a completed turn with usage");
    (result, (usage.input_tokens, usage.output_tokens))
}

/// The value of one sample of `GET /metrics`, 0 when absent.
async fn metric(server: &TestServer, sample: &str) -> u64 {
    use http_body_util::BodyExt;
    let resp = server.http.request_raw("GET", "/metrics", None).await;
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&body).to_string();
    text.lines()
        .find_map(|l| l.strip_prefix(sample)?.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sampling_request_is_answered_by_the_upstream_capped_and_counted_in_the_turn() {
    let fake = FakeOpenAi::start().await;
    let extra = sampling_server(
        "smp",
        "sampling = true\nsampling_max_tokens = 64\nsampling_calls_per_turn = 2",
    );
    let server = TestServer::start(&config_text(&fake, &extra)).await;
    let sid = server.session(json!({})).await;
    fake.push(
        Reply::tool_calls(&[(
            "call_ask",
            "mcp__smp__ask",
            json!({"prompt": "Say hi", "max_tokens": 5000, "image": true}),
        )])
        .usage(100, 10),
    );
    fake.push(Reply::text("Hi from the model").usage(7, 3));
    fake.push(Reply::text("The server said hi.").usage(1000, 20));
    turn(&server, &sid, "sample something").await;

    let (result, usage) = outcome(&server, &sid).await;
    assert_eq!(
        result,
        "caps_sampling=True\nsampled=Hi from the model model=fake-model stop=endTurn role=assistant"
    );
    // The turn's usage: its two model calls and the sampling call.
    assert_eq!(usage, (1107, 33));

    let reqs = fake.requests();
    assert_eq!(reqs.len(), 3, "{reqs:?}");
    let sampled = &reqs[1];
    // maxTokens 5000 asked, capped at sampling_max_tokens; no tools; the session's model.
    assert_eq!(sampled["max_tokens"], 64, "{sampled}");
    assert!(sampled.get("tools").is_none(), "{sampled}");
    assert_eq!(sampled["model"], "fake-model");
    assert_eq!(sampled["temperature"], json!(0.3));
    assert_eq!(sampled["stop"], json!(["END"]));
    assert_eq!(
        sampled["messages"][0],
        json!({"role": "system", "content": "Answer briefly."})
    );
    let user = &sampled["messages"][1];
    assert_eq!(user["role"], "user");
    assert_eq!(
        user["content"][0],
        json!({"type": "text", "text": "Say hi"})
    );
    assert_eq!(
        user["content"][1]["image_url"]["url"],
        "data:image/png;base64,iVBORw0KGgo="
    );
    assert_eq!(sampled["messages"].as_array().unwrap().len(), 2);
    // The model's next call sees what the tool got back.
    assert!(
        reqs[2]["messages"]
            .to_string()
            .contains("Hi from the model"),
        "{}",
        reqs[2]["messages"]
    );
    assert_eq!(
        metric(
            &server,
            "turnstile_mcp_sampling_total{server=\"smp\",outcome=\"ok\"}"
        )
        .await,
        1
    );
    assert_eq!(
        metric(
            &server,
            "turnstile_mcp_sampling_output_tokens_total{server=\"smp\"}"
        )
        .await,
        3
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sampling_request_past_the_turns_budget_is_refused_naming_the_key() {
    let fake = FakeOpenAi::start().await;
    let extra = sampling_server("bud", "sampling = true\nsampling_calls_per_turn = 2");
    let server = TestServer::start(&config_text(&fake, &extra)).await;
    let sid = server.session(json!({})).await;
    fake.push(Reply::tool_calls(&[(
        "call_ask",
        "mcp__bud__ask",
        json!({"prompt": "Count", "times": 3}),
    )]));
    fake.push(Reply::text("one").usage(2, 1));
    fake.push(Reply::text("two").usage(2, 1));
    fake.push(Reply::text("done"));
    turn(&server, &sid, "sample three times").await;

    let (result, usage) = outcome(&server, &sid).await;
    let lines: Vec<&str> = result.lines().collect();
    assert_eq!(
        lines,
        vec![
            "caps_sampling=True",
            "sampled=one model=fake-model stop=endTurn role=assistant",
            "sampled=two model=fake-model stop=endTurn role=assistant",
            "refused: sampling refused: this turn already made 2 sampling calls for bud (limit: [mcp_servers.bud] sampling_calls_per_turn in tools.toml)",
        ]
    );
    // Only the two calls within the budget reached the upstream (default usage 10/5 for the
    // turn's own two calls).
    assert_eq!(fake.requests().len(), 4);
    assert_eq!(usage, (24, 12));
    assert_eq!(
        metric(
            &server,
            "turnstile_mcp_sampling_total{server=\"bud\",outcome=\"refused\"}"
        )
        .await,
        1
    );

    // The budget is per turn: the next turn samples again.
    fake.push(Reply::tool_calls(&[(
        "call_again",
        "mcp__bud__ask",
        json!({"prompt": "Again"}),
    )]));
    fake.push(Reply::text("again").usage(2, 1));
    fake.push(Reply::text("done"));
    turn(&server, &sid, "once more").await;
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 7);
    assert!(reqs[6]["messages"]
        .to_string()
        .contains("sampled=again model=fake-model"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_sampling_true_gets_no_capability_and_its_request_is_refused() {
    let fake = FakeOpenAi::start().await;
    let server = TestServer::start(&config_text(&fake, &sampling_server("plain", ""))).await;
    let sid = server.session(json!({})).await;
    fake.push(Reply::tool_calls(&[(
        "call_ask",
        "mcp__plain__ask",
        json!({"prompt": "Say hi"}),
    )]));
    fake.push(Reply::text("done"));
    turn(&server, &sid, "sample something").await;

    let (result, usage) = outcome(&server, &sid).await;
    assert_eq!(
        result,
        "caps_sampling=False\nrefused: sampling refused: this server may not sample (set [mcp_servers.plain] sampling = true in tools.toml to allow it)"
    );
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2, "the upstream was asked to sample: {reqs:?}");
    assert!(reqs[1]["messages"]
        .to_string()
        .contains("sampling = true in tools.toml"));
    assert_eq!(usage, (20, 10));
    assert_eq!(
        metric(
            &server,
            "turnstile_mcp_sampling_total{server=\"plain\",outcome=\"refused\"}"
        )
        .await,
        1
    );
}

/// An MCP client of `/mcp` that answers sampling requests from "its model" (saying which
/// `maxTokens` it was asked for), or one that declares no sampling (`samples: false`).
#[derive(Clone)]
struct McpClient {
    samples: bool,
}

// Sampling is deprecated by SEP-2577 (a later protocol); servers of the current ones use it.
#[allow(deprecated)]
impl rmcp::ClientHandler for McpClient {
    fn get_info(&self) -> rmcp::model::ClientConfig {
        let mut info = rmcp::model::ClientConfig::default();
        #[allow(deprecated)]
        if self.samples {
            info.capabilities.sampling = Some(rmcp::model::SamplingCapability::default());
        }
        info
    }

    async fn create_message(
        &self,
        params: rmcp::model::CreateMessageRequestParams,
        _: rmcp::service::RequestContext<rmcp::RoleClient>,
    ) -> Result<rmcp::model::CreateMessageResult, rmcp::ErrorData> {
        let text = format!("client model, max_tokens {}", params.max_tokens);
        Ok(rmcp::model::CreateMessageResult::new(
            rmcp::model::SamplingMessage::assistant_text(text),
            "the-clients-model".into(),
        ))
    }
}

/// Call `mcp__<name>__ask` through `/mcp` as `client`: the tool's text.
async fn ask_through_mcp(
    server: &TestServer,
    name: &str,
    client: McpClient,
    args: Value,
) -> String {
    use rmcp::ServiceExt;
    let url = format!("http://{}/mcp", server.addr);
    let client = client
        .serve(turnstile::tools::mcp::http_client::transport(
            &url,
            std::collections::HashMap::new(),
            None,
        ))
        .await
        .expect("connect to /mcp");
    let mut params = rmcp::model::CallToolRequestParams::new(format!("mcp__{name}__ask"));
    params.arguments = args.as_object().cloned();
    let result = tokio::time::timeout(Duration::from_secs(30), client.peer().call_tool(params))
        .await
        .expect("the call answered within 30 s")
        .expect("the call succeeded");
    let _ = client.cancel().await;
    serde_json::to_value(&result.content).unwrap()[0]["text"]
        .as_str()
        .unwrap()
        .to_string()
}

/// `/mcp` over the sampling server `name` (each test its own: the metrics are the process's).
fn mcp_endpoint_config(fake: &FakeOpenAi, name: &str, server_keys: &str) -> String {
    let extra = format!(
        "{}\n[mcp_endpoint]\nenabled = true\nagents = [\"assistant\"]\n",
        sampling_server(name, server_keys)
    );
    config_text(fake, &extra)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_through_mcp_from_a_client_that_cannot_sample_is_refused() {
    let fake = FakeOpenAi::start().await;
    let server = TestServer::start(&mcp_endpoint_config(&fake, "ep", "sampling = true")).await;
    let text = ask_through_mcp(
        &server,
        "ep",
        McpClient { samples: false },
        json!({"prompt": "Say hi"}),
    )
    .await;
    assert_eq!(
        text,
        "caps_sampling=True\nrefused: sampling refused: the call in flight came through /mcp from a client that did not declare the sampling capability"
    );
    assert!(
        fake.requests().is_empty(),
        "the upstream was asked to sample"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_through_mcp_is_sampled_by_its_client_within_the_servers_budget() {
    let fake = FakeOpenAi::start().await;
    let keys = "sampling = true\nsampling_max_tokens = 64\nsampling_calls_per_turn = 2";
    let server = TestServer::start(&mcp_endpoint_config(&fake, "relayed", keys)).await;
    let text = ask_through_mcp(
        &server,
        "relayed",
        McpClient { samples: true },
        json!({"prompt": "Say hi", "max_tokens": 5000, "times": 3}),
    )
    .await;
    // The client's model answers (maxTokens capped at the server's sampling_max_tokens), twice:
    // the third request of the call is past sampling_calls_per_turn.
    assert_eq!(
        text,
        "caps_sampling=True\n\
         sampled=client model, max_tokens 64 model=the-clients-model stop=None role=assistant\n\
         sampled=client model, max_tokens 64 model=the-clients-model stop=None role=assistant\n\
         refused: sampling refused: this call already made 2 sampling requests for relayed (limit: [mcp_servers.relayed] sampling_calls_per_turn in tools.toml)"
    );
    assert!(
        fake.requests().is_empty(),
        "turnstile's upstream was asked to sample a call the client made"
    );
    assert_eq!(
        metric(
            &server,
            "turnstile_mcp_sampling_total{server=\"relayed\",outcome=\"ok\"}"
        )
        .await,
        2
    );
    assert_eq!(
        metric(
            &server,
            "turnstile_mcp_sampling_total{server=\"relayed\",outcome=\"refused\"}"
        )
        .await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_turns_log_line_counts_its_sampling_calls_and_their_tokens() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tools.toml");
    let extra = sampling_server("logd", "sampling = true");
    std::fs::write(&config, config_text(&fake, &extra)).unwrap();
    let mut child = crate::common::binary::command()
        .args(["--log-format", "json", "serve", "--config"])
        .arg(&config)
        .args(["--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn turnstile");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Value>();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                let _ = tx.send(v);
            }
        }
    });
    let listening = log_line(&mut rx, "listening on http://").await;
    let message = listening["fields"]["message"].as_str().unwrap();
    let addr = message.rsplit("http://").next().unwrap().parse().unwrap();
    let api = crate::common::Http::new(addr);
    let (status, v) = api.post("/sessions", &json!({})).await;
    assert_eq!(status, 201, "{v}");
    let sid = v["sessionId"].as_str().unwrap();
    fake.push(
        Reply::tool_calls(&[("call_ask", "mcp__logd__ask", json!({"prompt": "hi"}))])
            .usage(100, 10),
    );
    fake.push(Reply::text("sampled").usage(7, 3));
    fake.push(Reply::text("done").usage(1000, 20));
    let body = json!({"messages": [{"role": "user", "content": "go"}]});
    let (status, v) = api.post(&format!("/sessions/{sid}/turns"), &body).await;
    assert_eq!(status, 200, "{v}");
    let ended = log_line(&mut rx, "turn ended").await;
    let f = &ended["fields"];
    assert_eq!(
        (&f["sampling_calls"], &f["tokens_in"], &f["tokens_out"]),
        (&json!(1), &json!(1107), &json!(33)),
        "{ended}"
    );
    let _ = child.kill().await;
}

/// The next line of the JSON log whose message contains `what` (within 30 s).
async fn log_line(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Value>, what: &str) -> Value {
    let find = async {
        loop {
            let v = rx.recv().await.expect("turnstile's log ended");
            if v["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(what))
            {
                return v;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(30), find)
        .await
        .unwrap_or_else(|_| panic!("no log line {what:?} within 30 s"))
}
